"""Full updates: `moltcc --molt-program` builds program images and their
migration code (see docs/full-updates.md)."""
