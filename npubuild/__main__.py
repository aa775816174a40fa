from npubuild.cli import main

main()
