"""The ClientApp: node settings and the fleet table, local data, the profile cache, and one round of
work (profile → select → pin → fine-tune → restore → report)."""
