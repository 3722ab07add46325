"""A trained model as files: GGUF / safetensors for other tools (`model_files`) and the files a page hands
to a browser download (`downloads`).
"""
