"""Where a policy starts; imports ``update`` (batching) and the layers below ``train``.

``bootstrap`` (the embedded tiny model and tokenizer, policy loading, expert
demonstrations), ``pretrain`` (synthetic in-context copy pretraining of the tiny
model) and ``sft`` (supervised fine-tuning on demonstrations).
"""
