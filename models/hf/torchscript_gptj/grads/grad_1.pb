Bm.transformer.h.0.ln_1.biasJ@â(+ºœk;"C‘:6Š »¤rÉºÐ*%:ÐÒ¬º@–9öyk»Æ®µ:Ò1µ:
Z·º|y(:´F:ÇM;Ú
: