"""iosim: predicts and explains why FlashAttention is fast, from a model of a GPU's memory hierarchy."""
__version__ = "0.1.0"
