B+m.decoder.block.0.layer.2.layer_norm.weightJ@…()<¸FG<Œ­b<¤x‚¼Îè;sh
»¼CQ¼"wI;×e».
Ã<²8¼œË'<Mq˜<p%j»a»
¼'r(=