B&m.transformer.h.0.input_layernorm.biasJ@^Š¯»Õğ³:
ıÒºLØ:½¯ºçÈî:EH»³›Óº 29ÕG¹ºıİ‡:X¬Ó:ªÇÜ:b³»w¢#;Zl†;