"""The DeepSeek V3 / V3.2 model: config, layers and the model runner the engine drives."""
