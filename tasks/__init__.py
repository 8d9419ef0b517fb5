"""SeqIO task and mixture registrations, one module per family.

Importing this package makes the task factories available; tasks over prepared data are
registered when a gin file calls their factory (for example `lm.lm_task`), so the data
directory is always visible in the config rather than hidden in code.
"""
