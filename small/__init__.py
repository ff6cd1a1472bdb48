"""What only the small models need, kept out of the method's files: `grammar` (constrained replies: the
trie of allowed completions with jump-forward, a constrained extractor's operation heads and lesson plans)
and `presets` (the tiny and SmolLM2 settings, measured on a 2-core CPU, and the tiny actor's lesson prior)."""
