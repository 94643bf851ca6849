B/m.roberta.encoder.layer.0.output.LayerNorm.biasJ@Îv<Ô¸K;¤¼$¼»Š»AÆk;¹
å;DÏ‰;@»æOº4šàºtÃŒ»°UÇ96w•;Š¶å;[¼Ôß¹