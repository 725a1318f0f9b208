"""The data side: corpus files -> token cache -> each rank's batches.

``sources`` finds and reads the corpus (JSONL, Parquet, text), ``tokenization`` wraps the tokenizer,
``pretokenize`` turns a corpus into the memory-mapped token ``cache``, ``data`` serves a rank its packed
sequences from the epoch plan (:mod:`ft_trainer.planning.plan`), and ``bench_data`` measures that path.
Imports :mod:`ft_trainer.planning` and :mod:`ft_trainer.config`, never :mod:`ft_trainer.train`; no torch.
"""
