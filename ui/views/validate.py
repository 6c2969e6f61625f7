"""Show a load check: inputs and output shape."""

import streamlit as st


def show(result: dict) -> None:
    st.write(f"**{result['model']}** ({result['model_type']}) loaded; output shape {result['output_shape']}")
    st.table(result["inputs"])
