"""ddpviz web app (Streamlit + Altair). Imports no torch: it talks to runs through `workers.client`."""
