"""Training of the embedded tiny-chat model: the scripts (``python train/<script>.py``) and the synthetic chat
generator :mod:`train.tinychat`. Not in the installed package: the runtime loads only the trained weights."""
