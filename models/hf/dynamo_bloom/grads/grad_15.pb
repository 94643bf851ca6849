B+m.transformer.h.1.self_attention.dense.biasJ@ô}::X’Ï¹tu»Ñ:»½­;xı8²º>
ª;=@T;vài;ŒE9%7;ºïö»€©H:¹ı»li|»