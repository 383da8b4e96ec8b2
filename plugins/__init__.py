"""Built-in platform plugins (``dsa_runtime.plugins.*``), registered through the same entry-point group
(``dsa_runtime.plugins``) that third-party backend packages use."""
