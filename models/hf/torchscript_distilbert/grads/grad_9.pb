B.m.distilbert.transformer.layer.0.ffn.lin2.biasJ@¢tv;³Ä¯<Õ »xéº
uZ¼¼¼äÕW;b“:Ž1¼P~k9,¹;E¸m».´;ÕA6»È8(:¶&: