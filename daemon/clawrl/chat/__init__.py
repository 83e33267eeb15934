"""The OpenAI chat format, pure: validating a request, rendering the prompt, assembling tool
calls and splitting reasoning from the answer as it streams."""
