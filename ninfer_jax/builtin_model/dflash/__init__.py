"""The built-in model's DFlash drafter (scripts/train_builtin_dflash.py): a published drafter folder,
a package only so its files ship with ninfer_jax (`builtin.DRAFTER_NAME`)."""
