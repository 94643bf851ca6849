B5m.distilbert.transformer.layer.0.attention.v_lin.biasJ@ý.Ÿº‚‘¹Þzá¹
×P:…Ç8†^º)gà¹<ò1:â—:Ä|8Â*‰ºë·9b¬JºF^„:¯DŠ¹z&o: