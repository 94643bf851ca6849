B(m.gpt_neox.layers.0.input_layernorm.biasJ@`×¸´<Vº]âËº¶š‡ºŠI);1ytºnó:Ìõº³—¹
¼1¹ ®:¹Gó:ÎŒè:×­öºœ	¦¹Ìç™: