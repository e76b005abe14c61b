"""DeepSpeed's universal checkpoint layout, both ways.

    layout.py        the folder's names, and how to tell one
    reader.py        read_universal(tag_dir): a universal folder as a WholeCheckpoint
    writer.py        write_universal(whole, out): a WholeCheckpoint as a universal folder
"""
