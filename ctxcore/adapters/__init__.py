"""Adapters between ctxcore and agent frameworks' message types (optional extras).

`ctxcore.adapters.langchain` (``pip install 'ctxcore-llm[langchain]'``) and
`ctxcore.adapters.llamaindex` (``pip install 'ctxcore-llm[llamaindex]'``) convert the
frameworks' messages to `ctxcore.Message` and an `AssembledContext` back to theirs. Neither
is imported by ``import ctxcore``: the core never needs a framework installed.
"""
