"""Where a policy starts; imports ``update`` (batching) and the layers below ``train``.

``bootstrap`` (the embedded tiny model and tokenizer, policy loading, expert
demonstrations), ``pretrain`` (synthetic in-context copy pretraining of the tiny
model), ``sft`` (supervised fine-tuning on demonstrations) and ``few_shot`` (expert episodes shown
in the prompt, ``rollout.few_shot``).
"""
