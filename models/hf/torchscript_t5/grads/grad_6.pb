B+m.decoder.block.1.layer.2.layer_norm.weightJ@ÓÞ¼ÿ—ô;>½žÂ<¸½ð;Î:Æ[³º0Š3;Í
£¼-…À<¨¼Ã<*c¡:êÂÃ¼Pt§º rØ:ÃÖŽ<