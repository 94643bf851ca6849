B7m.distilbert.transformer.layer.1.attention.out_lin.biasJ@F@w;œ$­<œ|»8-ºgÇ`¼úë
¼"fb;–´¢:®A6¼äÔ9¯º¾;„‹q»ÖHµ;Ú¤$»êw>:(3: