"""Show a load check: inputs and output shape."""

import streamlit as st

from diagnostics.analyses.validate import ValidateResult
from diagnostics.render.tables import frame


def show(result: ValidateResult) -> None:
    st.write(f"**{result.model}** ({result.model_type}) loaded; output shape {result.output_shape}")
    st.table(frame(result.inputs))
