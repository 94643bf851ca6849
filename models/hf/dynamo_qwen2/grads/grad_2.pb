B0m.model.layers.0.post_attention_layernorm.weightJ@º¸È
§8Ø*9ª•Û9È®>¹æ0Ò8´3¸
2!9 ém¸ëÎË9Ž¹¼Èñ7@#z6˜Å¸9hMw7Ìfì8