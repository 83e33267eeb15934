"""Skills: skill_bridge inside the daemon, proposals drafted from repeated corrections, and the
`clawrl skills` command."""
