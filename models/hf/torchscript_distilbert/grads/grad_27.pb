Bm.vocab_transform.biasJ@┤ц#╫Б▓┴==÷=ки▒=²G■╫QдP=╗Ё└=~ ё╫7~╣=
╬QЯ╬╫Eщ3╫S÷e=М║╫▌В╫ HМ=