"""Learning: judged turns become LoRA versions. One training step (step.py) shared by the local
PEFT trainer and the Tinker trainer; the turn log's training side, the teacher, the advantages."""
