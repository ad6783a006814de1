"""OpenAI's protocol: request and response models, and the translation of chat, tool calls,
reasoning and logprobs between its shapes and the engine's."""
