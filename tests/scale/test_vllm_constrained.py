"""vLLM's structured outputs run the grammars horizonrl.inference.constrain builds (``make test-vllm``):
every sampled continuation is accepted by the grammar, token for token, and ends it."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("llguidance")

from helpers.grammars import ARGS, HI, TOOLS, accepts
from horizonrl.inference.base import SamplingParams
from horizonrl.inference.constrain import GrammarBuilder, GrammarVocab


@pytest.mark.vllm
def test_vllm_structured_outputs(tmp_path):
    pytest.importorskip("vllm")
    from horizonrl.config import ModelConfig
    from horizonrl.inference.vllm_engine import VLLMEngine
    from horizonrl.models import ChatRenderer, load_model_and_tokenizer
    from horizonrl.train.warmstart.bootstrap import build_tiny

    path = tmp_path / "model"  # head_dim 32: vLLM's CPU attention supports it
    build_tiny(ModelConfig(tiny_hidden=128, tiny_layers=2, tiny_vocab=400, tiny_pretrain_steps=20), path)
    model, tok = load_model_and_tokenizer(path)
    renderer = ChatRenderer(tok)
    b = GrammarBuilder.from_tokenizer(tok, renderer.eos_id)
    engine = VLLMEngine(model.eval(), tok, seed=0, max_batch_size=4, structured_outputs=True)
    try:
        assert engine.supports_grammar and not engine.supports_grammar_resume
        engine.eos_ids = engine.eos_ids | {renderer.eos_id}
        vocab = GrammarVocab(tok)
        for c, prompt in [
            (b.json_output(ARGS), renderer.initial_ids(HI)),
            (b.tool_calls(TOOLS, {"type": "function", "function": {"name": "add"}}), None),
        ]:
            if prompt is None:
                prompt = renderer.initial_ids(HI, TOOLS) + tok.encode(c.prefill, add_special_tokens=False)
            params = SamplingParams(max_new_tokens=120, grammar=c.grammar)
            for g in engine.generate([prompt] * 3, params):
                assert g.finish_reason == "stop" and accepts(vocab, c.grammar, g.ids)
                assert all(np.isfinite(g.logprobs)) and max(g.logprobs) <= 0
    finally:
        engine.close()
