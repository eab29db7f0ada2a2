"""Inference engines that speak SGLang's HTTP protocol: the embedded CPU engine and SGLang itself."""
