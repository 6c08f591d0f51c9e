"""The data plane: how StagePayloads and stream chunks move between stages and workers."""
