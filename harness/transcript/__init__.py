"""How an episode becomes token ids: the chat turn format, the context policy, step records."""
