"""The seams with ormas-monitor and with Ray: every piece ray-ormas uses beyond their public APIs,
in one place each, each checked so that a release that changes it fails loudly."""
