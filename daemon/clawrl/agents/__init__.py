"""Agents trained by the same loop: environments that drive the model through the daemon's API.

`sandbox` runs an agent's commands in a throwaway folder with limits and no network (`isolation`
finds out how much of that this machine allows); `env` names the protocol an environment speaks
(tasks, tools, verdicts); `envs/` holds the environments (toolcall, terminal, swe); `runner`
plays episodes against a daemon over HTTP and reports each outcome as explicit feedback; `recipe`
reads recipes/agents/*.toml. The daemon itself knows nothing of any of this: to it an episode is
a session of main turns with tool results as next states, and a feedback call per turn.
"""
