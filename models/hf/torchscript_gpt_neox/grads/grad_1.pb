B m.gpt_neox.final_layer_norm.biasJ@„ý£ºýó)»¤c¾º f'ºþ< 2;9vŸüº•»(ýì9R1;W‹Ü:Z×
;ºG<¨õ: ’%9˜Qž9