from pstrainer.cli import main

main()
