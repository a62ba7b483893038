"""Development tooling: never shipped in the wheel or the image."""
