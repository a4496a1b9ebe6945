"""Data: the shard format, the offline tokenizer, corpora to shards, FineWeb's download, the loader.
"""
