"""The vault study's probes (results/vault-*/, cispo-*/, smollm2-vault/; finished 2026-11-30, results/vault-first/),
kept apart from the probes any run can use. Each runs as `python -m probes.vault.NAME ...` (before 2026-12-01 they
were `probes.NAME`: a checkout of then, or a script copied into one, names them so).

    vault_controls  the vault with an oracle and a shuffled bank: does the actor use the answer? does it win again
                    what it won once, and can a lesson after a loss (the locked doors) help it?
    vault_lessons   a vault run's lessons against each vault's door
    vault_forms     can the untrained extractor read the opened door off an episode, in three prompt forms?
    cispo_vault     can CISPO alone teach the extractor to name the opened door, or after a loss the doors left
                    (fresh vaults, a scripted follower)?
    credit_trace    a vault run's first iterations replayed: which lessons the lift credit rewarded, whether the
                    actor followed them, and which generations CISPO trained with what advantage
"""
