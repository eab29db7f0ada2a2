"""Training backends: the contract (:mod:`.base`) and its implementations (:mod:`.pytorch`,
:mod:`.megatron`); ``train.backend`` in the config picks one."""
