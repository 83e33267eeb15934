"""Turn OpenAI chat messages (and tools) into the prompt the model sees.

Where the model's chat template knows tools, messages and tools go through it unchanged. Where it
does not (SmolLM2's has no tool support), the tools are described in the system prompt in the
widespread Hermes/Qwen style (`<tools>…</tools>`, calls as `<tool_call>{json}</tool_call>`), earlier
assistant tool calls are rendered in that same style, and tool results become `<tool_response>`
blocks, so the model sees the same conversation either way.
"""
from __future__ import annotations

import json

TOOLS_PREAMBLE = (
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n{tools}\n"
    "</tools>\n\nFor each function call, return a json object with function name and arguments "
    "within <tool_call></tool_call> XML tags:\n<tool_call>\n"
    '{{"name": <function-name>, "arguments": <args-json-object>}}\n</tool_call>'
)


def content_text(content) -> str:
    """Message content as plain text: a string, None, or a list of text parts."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    return "".join(part.get("text", "") for part in content)


def template_supports_tools(tokenizer) -> bool:
    return "tools" in (tokenizer.chat_template or "")


def _tool_call_text(call: dict) -> str:
    fn = call.get("function", {})
    args = fn.get("arguments", "{}")
    try:
        args = json.loads(args) if isinstance(args, str) else args
    except json.JSONDecodeError:
        pass  # keep the string as the model wrote it
    return "<tool_call>\n" + json.dumps({"name": fn.get("name"), "arguments": args}) + "\n</tool_call>"


def _inline_tools(messages: list[dict], tools: list[dict] | None) -> list[dict]:
    """Rewrite a tool-using conversation for a template that knows only role + content."""
    out: list[dict] = []
    for m in messages:
        role, text = m["role"], content_text(m.get("content"))
        if role == "developer":
            role = "system"
        if role == "assistant" and m.get("tool_calls"):
            calls = "\n".join(_tool_call_text(c) for c in m["tool_calls"])
            text = f"{text}\n{calls}" if text else calls
        elif role == "tool":
            block = f"<tool_response>\n{text}\n</tool_response>"
            # Consecutive tool results share one user message, as Qwen's template does.
            if out and out[-1].get("_tool_block"):
                out[-1]["content"] += "\n" + block
                continue
            out.append({"role": "user", "content": block, "_tool_block": True})
            continue
        out.append({"role": role, "content": text})
    if tools:
        spec = "\n".join(json.dumps(t.get("function", t)) for t in tools)
        preamble = TOOLS_PREAMBLE.format(tools=spec)
        if out and out[0]["role"] == "system":
            out[0] = {"role": "system", "content": f"{out[0]['content']}\n\n{preamble}"}
        else:
            out.insert(0, {"role": "system", "content": preamble})
    return [{"role": m["role"], "content": m["content"]} for m in out]


def render_prompt(tokenizer, messages: list[dict], tools: list[dict] | None) -> list[int]:
    """Token ids of the prompt, ending with the assistant generation header."""
    if template_supports_tools(tokenizer):
        msgs = [{**m, "content": content_text(m.get("content"))} for m in messages]
        ids = tokenizer.apply_chat_template(msgs, tools=tools or None, add_generation_prompt=True,
                                            tokenize=True, return_dict=False)
    else:
        ids = tokenizer.apply_chat_template(_inline_tools(messages, tools),
                                            add_generation_prompt=True, tokenize=True,
                                            return_dict=False)
    return list(ids)
