"""Helpers for tests, benchmarks and ``make demo``; NOT part of the wheel (pyproject's ``packages``
leaves this folder out, tests/test_packaging.py and tests/test_wheel_install.py check it).

``testing`` (a tiny tokenizer, corpus and cache; the local multi-rank launcher), ``synthetic`` (generated
corpora) and ``demo`` (``make demo``: the whole story on one machine). They run from a checkout:
``python -m ft_trainer.devtools.demo``.
"""
