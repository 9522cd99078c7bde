"""ClientApp: profile → select → pin → fine-tune → restore → report. Built in a later issue."""
