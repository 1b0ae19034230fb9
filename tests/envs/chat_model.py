"""A locally made Qwen-style chat model directory for the codec and agent loop tests (nothing downloaded).

`save_chat_tokenizer(out)` writes a small BPE over ASCII with Qwen's special tokens and
a Qwen2.5-style chat template (ChatML, tool calls in `<tool_call>` blocks, tool replies
in `<tool_response>` inside a user message); `save_chat_model(out)` adds a random
float32 Llama that vLLM's CPU backend loads.
"""

from __future__ import annotations

import json
import string
from pathlib import Path

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

ENDOFTEXT, IM_START, IM_END = "<|endoftext|>", "<|im_start|>", "<|im_end|>"
TOOL_CALL_TAGS = ["<tool_call>", "</tool_call>"]
SYSTEM = "You are a helpful assistant."

# Qwen2.5-Instruct's template with a shorter default system message.
QWEN_TEMPLATE = (
    "{%- if tools %}\n"
    "    {{- '<|im_start|>system\\n' }}\n"
    "    {%- if messages[0]['role'] == 'system' %}\n"
    "        {{- messages[0]['content'] }}\n"
    "    {%- else %}\n"
    f"        {{{{- '{SYSTEM}' }}}}\n"
    "    {%- endif %}\n"
    "    {{- \"\\n\\n# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\n"
    "You are provided with function signatures within <tools></tools> XML tags:\\n<tools>\" }}\n"
    "    {%- for tool in tools %}\n"
    "        {{- \"\\n\" }}\n"
    "        {{- tool | tojson }}\n"
    "    {%- endfor %}\n"
    "    {{- \"\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments "
    "within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{\\\"name\\\": <function-name>, \\\"arguments\\\": "
    "<args-json-object>}\\n</tool_call><|im_end|>\\n\" }}\n"
    "{%- else %}\n"
    "    {%- if messages[0]['role'] == 'system' %}\n"
    "        {{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}\n"
    "    {%- else %}\n"
    f"        {{{{- '<|im_start|>system\\n{SYSTEM}<|im_end|>\\n' }}}}\n"
    "    {%- endif %}\n"
    "{%- endif %}\n"
    "{%- for message in messages %}\n"
    "    {%- if (message.role == \"user\") or (message.role == \"system\" and not loop.first) or "
    "(message.role == \"assistant\" and not message.tool_calls) %}\n"
    "        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}\n"
    "    {%- elif message.role == \"assistant\" %}\n"
    "        {{- '<|im_start|>' + message.role }}\n"
    "        {%- if message.content %}\n"
    "            {{- '\\n' + message.content }}\n"
    "        {%- endif %}\n"
    "        {%- for tool_call in message.tool_calls %}\n"
    "            {%- if tool_call.function is defined %}\n"
    "                {%- set tool_call = tool_call.function %}\n"
    "            {%- endif %}\n"
    "            {{- '\\n<tool_call>\\n{\"name\": \"' }}\n"
    "            {{- tool_call.name }}\n"
    "            {{- '\", \"arguments\": ' }}\n"
    "            {{- tool_call.arguments | tojson }}\n"
    "            {{- '}\\n</tool_call>' }}\n"
    "        {%- endfor %}\n"
    "        {{- '<|im_end|>\\n' }}\n"
    "    {%- elif message.role == \"tool\" %}\n"
    "        {%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != \"tool\") %}\n"
    "            {{- '<|im_start|>user' }}\n"
    "        {%- endif %}\n"
    "        {{- '\\n<tool_response>\\n' }}\n"
    "        {{- message.content }}\n"
    "        {{- '\\n</tool_response>' }}\n"
    "        {%- if loop.last or (messages[loop.index0 + 1].role != \"tool\") %}\n"
    "            {{- '<|im_end|>\\n' }}\n"
    "        {%- endif %}\n"
    "    {%- endif %}\n"
    "{%- endfor %}\n"
    "{%- if add_generation_prompt %}\n"
    "    {{- '<|im_start|>assistant\\n' }}\n"
    "{%- endif %}\n"
)

_CORPUS = [
    f"<|im_start|>system\n{SYSTEM}<|im_end|>\n<|im_start|>user\nWhat is 37 plus 48?<|im_end|>\n",
    '<|im_start|>assistant\n<tool_call>\n{"name": "add", "arguments": {"a": 37, "b": 48}}\n</tool_call><|im_end|>\n',
    "<|im_start|>user\n<tool_response>\n85\n</tool_response><|im_end|>\n<|im_start|>assistant\nThe answer is 85.",
    "error: no valid tool call found in the turn; call a tool with a JSON object.",
    "The quick brown fox jumps over the lazy dog. Hello, world! name arguments result",
]


def train_chat_tokenizer(vocab_size: int = 320) -> Tokenizer:
    """A BPE over printable ASCII (every character its own token, plus merges) with Qwen's special tokens."""
    tok = Tokenizer(models.BPE())
    # Words with their leading space, digits one by one, runs of newlines, other characters alone.
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(r" ?[A-Za-z]+|\d|\n+|[^A-Za-z\d\n]"), behavior="isolated")
    tok.decoder = decoders.Fuse()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, min_frequency=2, special_tokens=[ENDOFTEXT, IM_START, IM_END],
        initial_alphabet=list(string.printable), show_progress=False,
    )
    tok.train_from_iterator(_CORPUS * 4, trainer=trainer)
    # Like Qwen's: added, but not special (they stay in decoded text either way).
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in TOOL_CALL_TAGS])
    return tok


def save_chat_tokenizer(out: Path, template_file: bool = False) -> Tokenizer:
    """tokenizer.json, tokenizer_config.json (the template in it, or in chat_template.jinja) and
    generation_config.json (eos: `<|im_end|>` and `<|endoftext|>`, as Qwen2.5-Instruct's)."""
    out.mkdir(parents=True, exist_ok=True)
    tok = train_chat_tokenizer()
    tok.save(str(out / "tokenizer.json"))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": None, "eos_token": IM_END,
        "pad_token": ENDOFTEXT, "clean_up_tokenization_spaces": False, "model_max_length": 1024,
    }
    if template_file:
        (out / "chat_template.jinja").write_text(QWEN_TEMPLATE)
    else:
        config["chat_template"] = QWEN_TEMPLATE
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")
    ids = {name: tok.token_to_id(name) for name in (ENDOFTEXT, IM_END)}
    generation = {"bos_token_id": ids[ENDOFTEXT], "eos_token_id": [ids[IM_END], ids[ENDOFTEXT]],
                  "pad_token_id": ids[ENDOFTEXT]}
    (out / "generation_config.json").write_text(json.dumps(generation, indent=2) + "\n")
    return tok


def save_chat_model(out: Path, eot_logit: float = 4.0, seed: int = 0) -> Path:
    """The tokenizer plus a random Llama (hidden 64, 1 layer, 2 heads of 32, float32).

    Random weights sample every token about equally, so the model would almost never end
    a turn; `eot_logit` adds about that much to `<|im_end|>`'s logit at every position
    (one hidden dimension is held constant through the layers and the output row of
    `<|im_end|>` reads it), so turns end on their own as well as by max_tokens: at 4.0 about
    one token in fifteen is `<|im_end|>` when sampling, and greedy turns end both ways.
    """
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    tok = save_chat_tokenizer(out)
    im_end, endoftext = tok.token_to_id(IM_END), tok.token_to_id(ENDOFTEXT)
    config = LlamaConfig(
        vocab_size=tok.get_vocab_size(), hidden_size=64, intermediate_size=128, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=2, head_dim=32, max_position_embeddings=1024,
        tie_word_embeddings=False, initializer_range=0.2, bos_token_id=endoftext, eos_token_id=[im_end, endoftext],
        pad_token_id=endoftext, dtype="float32",
    )
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config).eval()
    with torch.no_grad():
        model.model.embed_tokens.weight[:, 0] = 4.0  # dimension 0: the same large value for every token
        for layer in model.model.layers:  # ... that no layer writes to
            layer.self_attn.o_proj.weight[0, :] = 0.0
            layer.mlp.down_proj.weight[0, :] = 0.0
        # After the final RMSNorm dimension 0 is about the same at every position; only <|im_end|> reads it.
        model.lm_head.weight[:, 0] = 0.0
        sample = torch.arange(min(64, config.vocab_size))[None]
        hidden = model(sample, output_hidden_states=True).hidden_states[-1][0, :, 0].mean().item()
        model.lm_head.weight[im_end, 0] = eot_logit / hidden
    model.save_pretrained(out)  # also writes generation_config.json, with the same eos ids
    return out
