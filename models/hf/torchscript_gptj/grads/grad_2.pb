Bm.transformer.h.0.ln_1.weightJ@RÉH9{Ó,»VŽºVÂ%»ªP‘»%rºú¡;€>·_Pt9nP¡;JÖº„æ»Z—¯ºv“^¹plêºÍ
;