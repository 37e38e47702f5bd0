"""Entry point: `streamlit run app/main.py`. Routes only; each page is a file under app/pages/."""

import streamlit as st

st.set_page_config(page_title="ddpviz", layout="wide")
page = st.navigation([
    st.Page("pages/launch.py", title="Launch", icon="🚀", default=True),
    st.Page("pages/live.py", title="Live", icon="📈"),
    st.Page("pages/runs.py", title="Runs", icon="🗂️"),
])
page.run()
