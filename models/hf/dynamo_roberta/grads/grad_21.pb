B5m.roberta.encoder.layer.1.attention.output.dense.biasJ@v˜<´K;ÿé%¼+‹»"Ôa;U°ä;#ê‰;Í¡‰»bö>ºoMæº7Œ» Ö9”;c¥ä;|œ[¼¤´
º