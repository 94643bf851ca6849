
Bm.classifier.biasJ(>!Õ¾
VÛ=ÞëÉ=¹(é=ß~à=œ å=€g¬=Õ=ðÓ¾ìÊ=