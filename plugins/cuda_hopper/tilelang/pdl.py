"""Programmatic dependent launch (PDL) from the split decode programs to the combine kernel.

A split program's CTAs execute ``griddepcontrol.launch_dependents`` once their chunk loop is done; the combine
kernel, launched with PDL (``combine_splits(..., pdl=True)``), may then be scheduled while the partials are still
being stored, and waits (``griddepcontrol.wait``) for the whole program to finish and flush before it reads them.
FlashMLA's decode does the same before its combine. An inline-asm helper, not TileLang's ``T.pdl_trigger``: that
one lowers to ``cudaTriggerProgrammaticLaunchCompletion()``, which ptxas compiled as a call here (88 bytes of
spills in ``wsf8c``, 0 with this).
"""

PDL_SRC = r"""
__device__ __forceinline__ void dsa_launch_dependents() {
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
}
"""
