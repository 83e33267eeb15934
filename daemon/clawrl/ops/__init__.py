"""Operating clawrl: the `clawrl` command, status, doctor, the systemd service and the OpenClaw
config snippet."""
