"""The stand-in servers: a local OpenAI and Anthropic API answering as ``sim``, checked against the SDK types."""
