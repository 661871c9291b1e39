"""Tokenizers, token shards, data mixtures and the resumable sampler."""
