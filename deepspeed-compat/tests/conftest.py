import sys
from pathlib import Path

# --import-mode=importlib keeps test folders off sys.path; the shared helpers live here.
sys.path.insert(0, str(Path(__file__).parent))
